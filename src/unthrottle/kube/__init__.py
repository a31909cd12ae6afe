"""The Kubernetes API side: which workloads exist, and their containers' settings."""
