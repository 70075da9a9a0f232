package api

import (
	_ "embed"
	"net/http"
)

//go:embed demo/index.html
var demoPage []byte

// handleDemo serves the chat demo page (host dev).
func handleDemo(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Write(demoPage)
}
