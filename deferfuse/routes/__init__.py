"""The ways deferfuse serves an ATen call, one file per kind of op: lowered ops, views, in-place
and out= ops (`mutation`), expansions into smaller ops, the CPU fallback, copies and host reads,
allocation, data-dependent ops, and the argument wrappers. The router (dispatch.py) picks one per
overload; a route that runs smaller ops re-enters the router through `tensor.redispatch`.
"""
