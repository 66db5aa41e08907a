"""What every kernel family shares: `utils` (kernel registry, dtype policy, tiles), `launch` (validated launch
settings), `chunk_stages` (the stages of a gated chunk pass, gate on either side), `chunk_pass` (their launchers),
`fused_recurrent` (the step-by-step GLA/RWKV6 kernels)."""
