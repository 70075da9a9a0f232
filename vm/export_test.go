package vm

// Meter is meter, for the benchmarks of package vm_test.
var Meter = meter
