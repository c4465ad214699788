// cert-manager's controller with only what the chart uses: SelfSigned and CA Issuers, Certificates
// and their CertificateRequests, and the approver. cert-manager's own command is a module of its
// own that the Go module proxy cannot serve; its controllers are packages of the main module and
// register themselves when imported, so a small main runs them as that command does, without
// leader election (one replica, in a test cluster).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/cert-manager/cert-manager/pkg/controller"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *kubeconfig); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(ctx context.Context, kubeconfig string) error {
	factory, err := controller.NewContextFactory(ctx, controller.ContextOptions{
		Kubeconfig:         kubeconfig,
		KubernetesAPIQPS:   20,
		KubernetesAPIBurst: 50,
		IssuerOptions:      controller.IssuerOptions{ClusterResourceNamespace: "cert-manager"},
		CertificateOptions: controller.CertificateOptions{
			// cert-manager's defaults
			CertificateRequestMinimumBackoffDuration: time.Hour,
			CertificateRequestMaximumBackoffDuration: 32 * time.Hour,
		},
	})
	if err != nil {
		return err
	}
	shared, err := factory.Build()
	if err != nil {
		return err
	}
	var running sync.WaitGroup
	failures := make(chan error, len(controller.Known()))
	for name, construct := range controller.Known() {
		loop, err := construct(factory)
		if err != nil {
			return fmt.Errorf("controller %s: %w", name, err)
		}
		running.Add(1)
		go func() {
			defer running.Done()
			if err := loop.Run(5, ctx); err != nil {
				failures <- fmt.Errorf("controller %s: %w", name, err)
			}
		}()
	}
	shared.SharedInformerFactory.Start(ctx.Done())
	shared.KubeSharedInformerFactory.Start(ctx.Done())
	shared.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done())
	select {
	case err := <-failures:
		return err
	case <-ctx.Done():
	}
	running.Wait()
	return nil
}
