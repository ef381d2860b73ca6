"""The admin console: server-rendered pages under /admin/ for people signed in through OpenID Connect."""
