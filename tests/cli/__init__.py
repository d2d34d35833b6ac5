"""The tenant's CLI, `better-compute`."""
