"""``python -m hp_agent ...`` runs the ``hp-agent`` command line (what ``torchrun -m hp_agent`` launches)."""

from hp_agent.cli import app

app()
