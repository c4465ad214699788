"""GPU budgets of tenants: the keys, the tenancy tree, reservations and pools, and the rules of the
app check and of the declaration gate.

The arithmetic is that of Cozystack's tenant quota pools, so that a later pool-wide gate can take
over without changing any verdict. Plain values in, a verdict out; reading the cluster is the
edge's job (`hooks.kubeapi.budget`), which reads what `scope` says a verdict needs. What the gate
must keep true, after any sequence of admitted operations that starts from a consistent tree, is
the pool invariant: for every pool P and budget key K it declares, the reservations of P's members
plus the carve-outs of the bounded tenants in P stay within P's budget for K.

Objects that were read but do not decode arrive as data (`unreadable` says what and where). They
deny a verdict only when that verdict's arithmetic reads them; any others are listed in
`Verdict.skipped` so that the route can log them.

Modules, each importing only those before it: `keys`, `tenancy`, `reservations`, `pools`,
`verdicts`, `scope`, then `apps`, `declarations`, `usage` and `subtrees` (which pools a
namespace's labels name, for the report).
"""
