"""Unit tests: no root, no Go, no server."""
