"""`moeslots bench`: the engine measured, one module per benchmark: decode (speed at slot counts) and compare
(greedy text against 0 slots), mtp (drafts), repick (adaptive residency beside the simulator). `bench app` (the app
beside the engine alone) is tui/appbench.py."""
