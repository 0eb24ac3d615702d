"""The hpcrl console command."""
