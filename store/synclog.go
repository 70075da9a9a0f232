package store

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// logSync is SyncLog's hold on the file's write-ahead log: a descriptor of
// its own, kept open (SQLite's is out of reach), and the log it names, so a
// log made since (the file was closed and opened again) is opened anew and
// its directory entry synced.
type logSync struct {
	mu sync.Mutex
	f  *os.File
	fi os.FileInfo
}

// SyncLog makes every transaction committed so far durable: it
// fdatasyncs the file's write-ahead log (and the directory, the first time
// it sees that log), as SQLite syncs the log at each commit under
// SyncFull. A file
// opened with SyncNormal commits without it; with SyncLog after its commits
// it keeps SyncFull's guarantee while the sync runs off the committing
// goroutine: the host's output gate releases a commit's replies once a
// SyncLog that began after the commit returns. Unlike the rest of File,
// SyncLog may run concurrently with the file's transactions: it touches
// the log on disk only. It never opens the database file itself: closing
// a descriptor of it would drop SQLite's POSIX locks on it.
//
// Without a write-ahead log there is nothing to sync: an open file has
// one from its first write, and SQLite removes it only when the last
// connection closes, after a checkpoint that syncs the database file.
func (f *File) SyncLog() error {
	ls := &f.logSync
	ls.mu.Lock()
	defer ls.mu.Unlock()
	path := f.path + "-wal"
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if ls.f == nil || !os.SameFile(ls.fi, fi) {
		if ls.f != nil {
			ls.f.Close()
			ls.f = nil
		}
		w, err := os.Open(path)
		if err != nil {
			return err
		}
		// A log new to this file: its name must survive a power loss
		// too.
		if err := syncDir(filepath.Dir(path)); err != nil {
			w.Close()
			return err
		}
		ls.f, ls.fi = w, fi
	}
	// fdatasync: the log's frames and its size, without the
	// modification time fsync adds.
	if err := syscall.Fdatasync(int(ls.f.Fd())); err != nil {
		return &os.PathError{Op: "fdatasync", Path: path, Err: err}
	}
	return nil
}

// closeLogSync lets go of SyncLog's descriptor.
func (f *File) closeLogSync() {
	ls := &f.logSync
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.f != nil {
		ls.f.Close()
		ls.f, ls.fi = nil, nil
	}
}

// syncDir fsyncs the directory at path.
func syncDir(path string) error {
	d, err := os.Open(path)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
