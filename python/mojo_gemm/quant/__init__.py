"""Host-side (numpy) quantizers and packers."""
