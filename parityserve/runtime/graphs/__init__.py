"""Stateful service graphs (HAMS): one ``GraphRuntime`` per graph, behind one small face
(``registry``). ``hams_graph.GraphRuntime`` is itself a thin face over pieces with one job
each (``hams_context`` lists them: requests, dispatch, inbox, membership, watch, recovery,
baselines, inspection); the protocol they speak is typed records (``hams_messages``, kinds
and launch spec in ``hams_protocol``), and ``hams_worker`` is the operator process itself.
The decisions are pure, in ``core/hams``.

May import the wings below it: ``fleet``, ``modelpath``, ``workers``; never ``serving``,
``frontend`` or ``cluster``.
"""
