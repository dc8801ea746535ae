"""One model's path through the frontend: the asyncio driver of the core scheduler
(``dispatch``: queues, batching, redundancy, cache), the coercion of a query to the model's
signature (``tensors``, ``edge_array``), loop pressure, and the Prometheus metrics
(``metrics``, ``buffered_histogram``, ``state_metrics``).

May import only ``workers`` below it.
"""
