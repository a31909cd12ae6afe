"""The real control plane (etcd, kube-apiserver, controllers, kwok) and the real node
(containerd, runc, kubelet): the operator, apply, the chart, the reports."""
