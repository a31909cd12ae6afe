"""The operator: ThrottlePolicy reconciles over the shared scan (Kopf lives only here)."""
