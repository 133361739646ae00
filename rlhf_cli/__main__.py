"""``python -m rlhf_cli ...`` runs the ``rlhf`` command (for a checkout without the console script on PATH)."""
from rlhf_cli import main

raise SystemExit(main())
