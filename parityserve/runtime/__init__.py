"""The I/O layer: the serving runtime, in wings along a request's path, top to bottom.

``server.py`` wires them; each wing may import only the wings below it
(tests/unit/test_import_graph.py checks it; each wing's ``__init__`` says what lives there):

    cluster    shards, shard mesh, peer frontends
    frontend   HTTP, gRPC, auth, connection guards, OpenAPI, edge decoding
    serving    the one data plane: serving system, applications, router, admin ops, state store
    graphs     stateful service graphs (HAMS): graph runtime, operators, their protocol
    fleet      worker processes: launchers (local, Ray), placement, supervisor, health
    modelpath  one model's asyncio driver of the core scheduler, its coercion and metrics
    workers    the worker process, the typed protocol both ways, the channel and its keys
"""
