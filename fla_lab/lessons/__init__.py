"""One module per notebook: the sweeps, figures and explorers that notebook's story needs."""
