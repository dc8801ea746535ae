"""Stateful service graphs (HAMS): one ``GraphRuntime`` per graph, behind one small face
(``registry``); the runtime driving a graph's primary, backup and spare operators
(``hams_graph``, ``hams_members``, ``hams_state``, ``hams_replay``), the protocol they speak
(``hams_protocol``) and the operator process itself (``hams_worker``). The decisions are pure,
in ``core/hams``.

May import the wings below it: ``fleet``, ``modelpath``, ``workers``; never ``serving``,
``frontend`` or ``cluster``.
"""
