"""The bootstrapped policy at iteration 0: the tiny preset's bar (`tiny_bootstrap`), the designer's repertoire under novelty (`designer_repeats`), the agent's accepted actions (`action_validity`)."""
