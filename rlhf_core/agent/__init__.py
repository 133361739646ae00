"""Multi-turn agent loops (verl ``experimental/agent_loop``): trajectories of assistant and tool turns."""
