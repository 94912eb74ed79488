"""``python -m minigrpo.control``: train PPO with an env's preset (``minigrpo.control.ppo.main``); under
``accelerate launch --num_processes N`` (or ``torchrun``) data-parallel over N × num_envs env copies."""

from minigrpo.control.ppo import main

raise SystemExit(main())
