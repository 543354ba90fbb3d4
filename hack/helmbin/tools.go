//go:build tools

// Package tools pins the helm command for `go build` in this build-only module.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
