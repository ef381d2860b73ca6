"""Who is calling: bearer JWT verification (tokens) and JWKS key fetching (jwks)."""
