"""The websocket bridge to DSH hosts and GoalBar clients (not built yet)."""
