"""The test bed that tests and benchmarks share: real processes (`procs`), the one local federation (`federation`),
sites in network namespaces (`netns`), WAN faults (`faults`), federated jobs and the toy client (`fedjob`,
`toy_client`, `fedruns`), toy and recovery jobs (`clusters`), and the attackers' tools (`attackers`, `updates`,
`audit`). Library code never imports it."""
