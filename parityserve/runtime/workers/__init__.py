"""The worker process and what both ends of its channel share: the typed messages both ways
(``messages``, ``commands``), their framing (``wire``), the ZeroMQ link (``rpc``), the hello
(``handshake``) and the CURVE keys (``keys``, ``credentials``, ``secret_files``).

The lowest wing: it imports no other wing, only ``core``, ``models`` and the package's leaves.
"""
