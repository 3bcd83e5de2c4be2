"""This machine: what it has, its threads, its measured costs (calibration), the models it holds."""
