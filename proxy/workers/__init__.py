"""Several worker processes behind one instance: the supervisor that starts, restarts and signals them."""
