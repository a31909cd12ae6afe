// Command etcd is etcd's own server entry point, built from go.etcd.io/etcd/server/v3
// at the version that k8s.io/kubernetes itself is tested with (see go.mod).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
