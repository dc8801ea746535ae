"""The one data plane behind every edge: the serving system (``system``), its face that every
inference request from every edge goes through (``face``: application, graph or model, their
checks and errors, decided once; the records are in ``api``), applications and their routing
to models (``applications``, ``router``, ``lookup``), admin operations (``admin_ops``),
answers and their settling (``answers``, ``settle``, ``expected``) and the state store that
survives a restart (``state_store``).

May import the wings below it: ``graphs``, ``fleet``, ``modelpath``, ``workers``; never
``frontend`` or ``cluster``.
"""
