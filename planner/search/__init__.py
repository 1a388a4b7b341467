"""The search: the declared space and its rules (``space``), the plan and scale programs solved by
``solver.layout`` (``plan``), and expert placement (``experts``, with DeepSeek's EPLB as the
baseline in ``eplb``). Imports the cost model, the model side, ``solver`` and ``topologies``."""
