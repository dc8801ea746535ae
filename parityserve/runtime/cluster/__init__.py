"""Several frontends as one service: shards (one slice of the models each), the shard mesh
that forwards a request to the shard that owns its model, and peer frontends that share one
deployment and its log (``peers``, ``peer_log``).

The top wing under ``runtime/server.py``: it may import every wing below it (``frontend``,
``serving``, ``graphs``, ``fleet``, ``modelpath``, ``workers``), and none imports it.
"""
