"""`better-compute-agent`: the node agent that runs on each GPU host and reports it to the service."""
