"""The Engine the app talks to: the chat loop, its state, slots, residency, the automatic profile."""
