// Package store is an object's SQLite file, the truth its handlers and
// readers see: its state, its event log, its edges as a publisher (with
// their in-memory cache and the connection floor), its receive cursors as
// a follower, its one pending alarm (Alarm; ReadAlarm looks without
// opening the file for writing), the calls it recorded with their
// replies (so a repeated call happens once in effect), its size cap, and
// the schema's version with the steps that upgrade a file written by an
// earlier binary.
//
// A File is the object's own read-write connection, used by one goroutine
// at a time through a Tx. Every read of a log, in a transaction or from
// another process's copy through Read, is one Query. A Tx can defer its
// state writes and appends to its commit (Defer: a batch of calls that
// write one key writes it once), and answers reads of what it wrote
// without SQLite; what it commits is what it would writing through.
//
// It does not deliver, route or decide anything: the pump, slicing,
// filters' syntax, the wire format and streams are in delivery; where
// files live, when they open, who may write them and when an alarm runs
// are the host's; it
// imports neither. A filter reaches it as a func over the payload.
package store
