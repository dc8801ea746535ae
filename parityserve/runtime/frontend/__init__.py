"""The edges a request comes in by: HTTP (Clipper routes, KServe V2 REST, graph routes, the
admin API) and gRPC (KServe V2), with what guards them before any model is asked: the admin
token (``auth``), connection limits and timeouts (``connection``, ``hot_cycle``), the OpenAPI
document (``openapi``, ``schema``), the V2 codecs (``v2``), the Clipper body codec
(``clipper``) and its fast decoding of plain numbers (``edge_json``).

It decides nothing about models: each edge decodes its wire format into one
``serving.api.InferenceRequest``, calls ``ServingSystem.infer``, and encodes the ``Answer``
(or maps the error to its own status code) back into bytes. May import the wings below it:
``serving``, ``graphs``, ``fleet``, ``modelpath``, ``workers``; never ``cluster``.
"""
