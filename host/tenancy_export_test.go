package host

// ScanUsage recounts the tenants' object files now instead of at the next
// tick, for tests of the tenant storage limit.
func (n *Node) ScanUsage() { scanUsage(n.cfg.DataDir, n.usage) }
