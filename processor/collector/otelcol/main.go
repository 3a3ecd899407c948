// The OpenTelemetry Collector that otel-guard's tests run against: built from the Collector's own
// upstream modules, pinned to one release (v0.161.0 of core and contrib: the newest at which the module proxy serves
// contrib's loadbalancing exporter and filter processor), with the
// components the configs in processor/collector/ use. Go is only the tests' Collector; the product
// stays Python. Built by scripts/build-collector into .collector/ (ignored, cached).
package main

import (
	"log"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/exporter/debugexporter"
	"go.opentelemetry.io/collector/exporter/otlpexporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/processor/batchprocessor"
	"go.opentelemetry.io/collector/processor/memorylimiterprocessor"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"

	"github.com/open-telemetry/opentelemetry-collector-contrib/exporter/loadbalancingexporter"
	"github.com/open-telemetry/opentelemetry-collector-contrib/processor/filterprocessor"
)

func components() (otelcol.Factories, error) {
	var err error
	// The Collector's own telemetry (its logs and metrics), which every Collector must be given.
	factories := otelcol.Factories{Telemetry: otelconftelemetry.NewFactory()}
	if factories.Receivers, err = otelcol.MakeFactoryMap(otlpreceiver.NewFactory()); err != nil {
		return factories, err
	}
	if factories.Processors, err = otelcol.MakeFactoryMap(
		batchprocessor.NewFactory(), memorylimiterprocessor.NewFactory(), filterprocessor.NewFactory(),
	); err != nil {
		return factories, err
	}
	if factories.Exporters, err = otelcol.MakeFactoryMap(
		otlpexporter.NewFactory(), debugexporter.NewFactory(), loadbalancingexporter.NewFactory(),
	); err != nil {
		return factories, err
	}
	return factories, nil
}

func main() {
	info := component.BuildInfo{Command: "otelcol-otel-guard", Description: "otel-guard's test Collector", Version: "0.161.0"}
	settings := otelcol.CollectorSettings{
		BuildInfo: info,
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				ProviderFactories: []confmap.ProviderFactory{fileprovider.NewFactory(), envprovider.NewFactory()},
			},
		},
	}
	if err := otelcol.NewCommand(settings).Execute(); err != nil {
		log.Fatal(err)
	}
}
