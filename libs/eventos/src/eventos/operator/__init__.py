"""What an operator reads and does besides the employees themselves (SPEC §12, §17): dead
letters and their replay, attention items and their actions."""
