"""The docs' figures against saved results."""
