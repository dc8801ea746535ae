"""The worker process and what both ends of its channel share: the typed messages both ways
(``messages``, ``commands``), their framing (``wire``), the ZeroMQ link (``rpc``), the hello
(``handshake``), the CURVE keys (``keys``, ``credentials``, ``secret_files``), and the niceness
a worker started on a Ray node takes from its frontend (``niceness``).

The lowest wing: it imports no other wing, only ``core``, ``models`` and the package's leaves.
"""
