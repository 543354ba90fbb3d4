//go:build tools

// Package tools pins the prometheus and promtool commands for `go build` in this build-only module.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
