"""What every op's slice builds on: the kernel package (`extension`), numpy <-> MAX host buffers
(`host`), GPU target support (`targets`), the launch-plan op runner (`plan_op`) and the
`Rule` / `Contract` machinery of the shape/dtype rules (`rules`)."""
