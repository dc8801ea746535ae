"""The worker processes of a deployment: starting them (``launcher`` locally,
``ray_launcher`` on Ray), placing them (``placement_plan``, ``slots``), supervising and
restarting them (``supervisor``, ``restart_tracker``, ``health``), their replies on the way in
(``inbox``), and their parallelism (``parallelism``).

May import the wings below it: ``modelpath``, ``workers``; never ``graphs``, ``serving``,
``frontend`` or ``cluster``.
"""
