"""A real Prometheus, VictoriaMetrics, a browser or a TLS server on loopback, without the node
or the control plane."""
