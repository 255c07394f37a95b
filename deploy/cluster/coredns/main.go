// Command coredns is the cluster's DNS: CoreDNS with only the plugins the local cluster's
// Corefile uses. There is no forward plugin on purpose: a name outside the cluster gets an
// answer made here, so no query ever leaves the machine.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/template"
)

// The order in which a query passes the plugins: the relative order of CoreDNS's own plugin.cfg.
var directives = []string{
	"reload",
	"ready",
	"health",
	"prometheus",
	"errors",
	"log",
	"loadbalance",
	"cache",
	"template",
	"kubernetes",
}

func main() {
	dnsserver.Directives = directives
	coremain.Run()
}
