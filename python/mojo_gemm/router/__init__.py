"""MoE routing in one op (op `moe_route_topk_group`): `op` (graph function `moe_route`, its
result `MoERouting`), `contract`."""
