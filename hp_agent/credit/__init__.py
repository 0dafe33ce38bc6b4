"""The credit stage (DESIGN.md steps 5-6): one step's scored trajectories in, the learner's
token credit out.

- :mod:`~hp_agent.credit.registry`: the rules ``algo.name`` selects (no torch, so the
  config stays light); :func:`~hp_agent.credit.registry.register_credit` adds one.
- :mod:`~hp_agent.credit.rules`: the rules themselves, pure functions of a
  :class:`~hp_agent.credit.rules.CreditBatch` (HP-RLVR, GRPO, REINFORCE).
- :mod:`~hp_agent.credit.baseline`: the historical baseline b.
- :mod:`~hp_agent.credit.assembly`: trajectories and their scores -> a CreditBatch ->
  the rule -> :class:`~hp_agent.credit.assembly.TrainingSample` per turn, and the baseline update.

This package imports nothing on its own: each module is imported by name.
"""
