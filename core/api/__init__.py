"""The API's shared pieces, a module a job: import each from its module.

* `core.api.envelope`: the error envelope and Django's and DRF's error handlers.
* `core.api.fields`: strict input serializers and fields.
* `core.api.parsing`: the JSON body's checks, parser and renderer.
* `core.api.rpc`: the RPC viewset base, `rpc_action` and the view's steps.
"""
