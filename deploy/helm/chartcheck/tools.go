//go:build tools

// The helm command, built from this module's requirements by 'make helm' (bin/helm), so
// 'helm template deploy/helm/kedge' works offline with the Helm these tests use.
package chartcheck

import _ "helm.sh/helm/v3/cmd/helm"
