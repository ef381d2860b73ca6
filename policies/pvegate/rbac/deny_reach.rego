# Scoped denies on guests the gateway cannot place (part of RBAC; the package's METADATA is
# in rbac.rego). A deny holds where its scope covers the target or any guest the call
# reaches (rbac.rego deny_applies). A reached guest whose node is not known — an HA group
# move (the HA manager picks the node), a backup's guest that is gone or could not be read,
# a volume whose owner could not be looked up — may be on a node the deny fences: a
# node-scoped deny holds there (fail closed), as it does on a prune whose reach is unknown.
# (A pool the gateway cannot see is pool_known false — a hidden pool, or a backup's guest that
# is gone or could not be read: the hidden-pool rules in rbac.rego make a pool-scoped deny hold.)
package pvegate.rbac

deny_applies(b, target) if {
	fences_nodes(object.get(b, "scope", {}), target)
	some k in ["destination", "backup_of"]
	is_object(target[k])
	object.get(target[k], "node", null) == null
}

# a volume's owner that could not be looked up (exists null; an ISO's content is null: nobody's)
deny_applies(b, target) if {
	fences_nodes(object.get(b, "scope", {}), target)
	target.volume_of.content != null
	target.volume_of.exists == null
	object.get(target.volume_of, "node", null) == null
}

# fences_nodes(scope, target): the scope names nodes, and a cluster the call is in if it names
# clusters (a deny fencing another cluster's nodes stays there)
fences_nodes(scope, target) if {
	"nodes" in object.keys(scope)
	attr_listed(scope, "clusters", target, "cluster")
}
