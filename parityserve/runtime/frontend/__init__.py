"""The edges a request comes in by: HTTP (Clipper routes, KServe V2 REST, graph routes, the
admin API) and gRPC (KServe V2), with what guards them before any model is asked: the admin
token (``auth``), connection limits and timeouts (``connection``, ``hot_cycle``), the OpenAPI
document (``openapi``, ``schema``), the V2 codecs (``v2``) and the fast decoding of Clipper
bodies (``edge_json``).

It decides nothing about models: it turns a request into a call on ``serving`` and the answer
back into bytes. May import the wings below it: ``serving``, ``graphs``, ``fleet``,
``modelpath``, ``workers``; never ``cluster``.
"""
