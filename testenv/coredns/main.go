// CoreDNS with only the plugins a one-node test cluster's DNS needs: the cluster.local zone from
// the API server (kubernetes), health and readiness, a cache. No forward: the cluster's network
// namespace has no route out, and nothing in it needs names outside cluster.local.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	// The order in which the plugins see a query, as CoreDNS's own list orders them.
	dnsserver.Directives = []string{"bind", "ready", "health", "errors", "cache", "kubernetes"}
}

func main() {
	coremain.Run()
}
