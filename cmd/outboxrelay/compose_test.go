package main

import (
	"context"
	"encoding/json"
	"maps"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

// The compose file and the profile that adds Prometheus, Grafana and a
// demo producer to the default stack.
const (
	composeFile          = "../../docker-compose.yml"
	observabilityProfile = "observability"
)

// defaultServices and observabilityServices are the services of the
// default stack and those the observability profile adds.
var (
	defaultServices       = []string{"outboxrelay", "postgres", "rabbitmq"}
	observabilityServices = []string{"demo-queue", "grafana", "producer", "prometheus"}
)

// loadCompose loads docker-compose.yml with compose-go, the loader docker
// compose itself uses: it validates the file against the Compose
// specification's schema, applies the profiles as docker compose does and
// resolves relative paths (build contexts, bind mounts) against the
// file's directory. No variable of the test's environment is interpolated.
func loadCompose(t *testing.T, profiles ...string) *types.Project {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{composeFile},
		cli.WithName("outboxrelay"),
		cli.WithEnv(nil),
		cli.WithProfiles(profiles),
	)
	require.NoError(t, err)
	project, err := opts.LoadProject(context.Background())
	require.NoError(t, err, "docker-compose.yml does not load")
	return project
}

// envVars lists the environment variables a command (its struct type) reads.
func envVars(v reflect.Type, into map[string]bool) {
	for i := range v.NumField() {
		f := v.Field(i)
		if f.Anonymous {
			envVars(f.Type, into)
			continue
		}
		if env := f.Tag.Get("env"); env != "" {
			into[env] = true
		}
	}
}

// flagNames lists the flags a command (its struct type) takes.
func flagNames(v reflect.Type, into map[string]bool) {
	for i := range v.NumField() {
		f := v.Field(i)
		if f.Anonymous {
			flagNames(f.Type, into)
			continue
		}
		if name := f.Tag.Get("name"); name != "" {
			into[name] = true
		}
	}
}

// env returns a service's environment as plain strings (a variable
// without a value maps to "").
func env(s types.ServiceConfig) map[string]string {
	out := map[string]string{}
	for k, v := range s.Environment {
		out[k] = ""
		if v != nil {
			out[k] = *v
		}
	}
	return out
}

// published lists a service's ports as "host:container".
func published(s types.ServiceConfig) []string {
	var out []string
	for _, p := range s.Ports {
		out = append(out, p.Published+":"+strconv.FormatUint(uint64(p.Target), 10))
	}
	return out
}

// hostPath maps a path inside a service's container to the file of the
// repository a bind mount puts there, and fails the test if none does.
func hostPath(t *testing.T, s types.ServiceConfig, inContainer string) string {
	t.Helper()
	best := -1
	for i, v := range s.Volumes {
		if v.Type != types.VolumeTypeBind {
			continue
		}
		if inContainer == v.Target || strings.HasPrefix(inContainer, strings.TrimSuffix(v.Target, "/")+"/") {
			if best < 0 || len(v.Target) > len(s.Volumes[best].Target) {
				best = i
			}
		}
	}
	require.GreaterOrEqual(t, best, 0, "%s: no bind mount provides %s", s.Name, inContainer)
	v := s.Volumes[best]
	rel := strings.TrimPrefix(strings.TrimPrefix(inContainer, v.Target), "/")
	return filepath.Join(v.Source, filepath.FromSlash(rel))
}

// httpAddrPort is the port of the relay's OUTBOX_HTTP_ADDR.
func httpAddrPort(t *testing.T, relay types.ServiceConfig) string {
	t.Helper()
	addr, ok := env(relay)["OUTBOX_HTTP_ADDR"]
	require.True(t, ok, "the relay sets OUTBOX_HTTP_ADDR")
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err, "OUTBOX_HTTP_ADDR %q", addr)
	require.NotEmpty(t, port)
	return port
}

// TestDockerComposeAgreesWithTheRelay loads docker-compose.yml (it cannot
// be started here) and checks that its default stack's services, ports
// and environment match what the relay reads.
func TestDockerComposeAgreesWithTheRelay(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)
	require.ElementsMatch(t, defaultServices, slices.Collect(maps.Keys(c.Services)),
		"the default stack (no profile)")

	pg := c.Services["postgres"]
	require.Contains(t, published(pg), "5432:5432")
	require.NotNil(t, pg.HealthCheck)
	rmq := c.Services["rabbitmq"]
	require.Contains(t, rmq.Image, "management", "RabbitMQ with the management UI")
	require.Contains(t, published(rmq), "5672:5672")
	require.Contains(t, published(rmq), "15672:15672")
	require.NotNil(t, rmq.HealthCheck)

	relay := c.Services["outboxrelay"]
	require.NotNil(t, relay.Build, "the relay is built from the repository")
	require.FileExists(t, filepath.Join(relay.Build.Context, relay.Build.Dockerfile))
	require.Equal(t, types.ServiceConditionHealthy, relay.DependsOn["postgres"].Condition)
	require.Equal(t, types.ServiceConditionHealthy, relay.DependsOn["rabbitmq"].Condition)

	known := map[string]bool{}
	envVars(reflect.TypeOf(RunCmd{}), known)
	relayEnv := env(relay)
	for k := range relayEnv {
		require.True(t, known[k], "the relay reads no variable %s", k)
	}
	require.NotEqual(t, "false", relayEnv["OUTBOX_MIGRATE"], "the relay migrates on start")
	port := httpAddrPort(t, relay)
	require.Contains(t, published(relay), port+":"+port, "the relay's /metrics is published on its port")

	db, err := url.Parse(relayEnv["DATABASE_URL"])
	require.NoError(t, err)
	require.Equal(t, "postgres", db.Hostname())
	require.Equal(t, "5432", db.Port())
	pgEnv := env(pg)
	require.Equal(t, pgEnv["POSTGRES_USER"], db.User.Username())
	pw, _ := db.User.Password()
	require.Equal(t, pgEnv["POSTGRES_PASSWORD"], pw)
	require.Equal(t, pgEnv["POSTGRES_DB"], strings.TrimPrefix(db.Path, "/"))

	amqpURL, err := url.Parse(relayEnv["AMQP_URL"])
	require.NoError(t, err)
	require.Equal(t, "rabbitmq", amqpURL.Hostname())
	require.Equal(t, "5672", amqpURL.Port())
}

// prometheusConfig is the part of prometheus.yml the stack relies on.
type prometheusConfig struct {
	RuleFiles     []string `yaml:"rule_files"`
	ScrapeConfigs []struct {
		JobName       string `yaml:"job_name"`
		StaticConfigs []struct {
			Targets []string `yaml:"targets"`
		} `yaml:"static_configs"`
	} `yaml:"scrape_configs"`
}

// grafanaDatasources is a Grafana datasource provisioning file.
type grafanaDatasources struct {
	Datasources []struct {
		Name      string `yaml:"name"`
		UID       string `yaml:"uid"`
		Type      string `yaml:"type"`
		URL       string `yaml:"url"`
		IsDefault bool   `yaml:"isDefault"`
	} `yaml:"datasources"`
}

// grafanaDashboards is a Grafana dashboard provider provisioning file.
type grafanaDashboards struct {
	Providers []struct {
		Type    string `yaml:"type"`
		Options struct {
			Path string `yaml:"path"`
		} `yaml:"options"`
	} `yaml:"providers"`
}

// TestDockerComposeObservabilityProfile loads docker-compose.yml with the
// observability profile and checks that Prometheus scrapes the relay
// where it listens and loads the repository's alerts, that Grafana is
// provisioned with that Prometheus and the repository's dashboard, that
// every file mounted exists, and that the producer runs the relay's emit
// against the relay's database.
func TestDockerComposeObservabilityProfile(t *testing.T) {
	t.Parallel()
	plain := loadCompose(t)
	c := loadCompose(t, observabilityProfile)
	require.ElementsMatch(t, append(slices.Clone(defaultServices), observabilityServices...),
		slices.Collect(maps.Keys(c.Services)))
	for _, name := range defaultServices {
		require.Empty(t, c.Services[name].Profiles, "%s belongs to the default stack", name)
		require.Equal(t, plain.Services[name], c.Services[name], "the profile leaves %s as it is", name)
	}
	for _, name := range observabilityServices {
		require.Equal(t, []string{observabilityProfile}, c.Services[name].Profiles, "%s only in the profile", name)
		require.Contains(t, plain.DisabledServices, name, "%s is off without the profile", name)
	}

	repo, err := filepath.Abs("../..")
	require.NoError(t, err)
	for _, name := range observabilityServices {
		s := c.Services[name]
		if s.Image != "" {
			_, tag, ok := strings.Cut(s.Image, ":")
			require.True(t, ok && tag != "latest", "%s: image %s pinned to a version", name, s.Image)
		}
		for _, v := range s.Volumes {
			require.Equal(t, types.VolumeTypeBind, v.Type, "%s: %s", name, v.Target)
			require.True(t, v.ReadOnly, "%s mounts %s read-only", name, v.Target)
			rel, err := filepath.Rel(repo, v.Source)
			require.NoError(t, err)
			require.False(t, strings.HasPrefix(rel, ".."), "%s mounts %s from outside the repository", name, v.Source)
			_, err = os.Stat(v.Source)
			require.NoError(t, err, "%s mounts %s", name, v.Source)
		}
	}

	relay := c.Services["outboxrelay"]
	relayEnv := env(relay)
	port := httpAddrPort(t, relay)

	t.Run("prometheus", func(t *testing.T) {
		prom := c.Services["prometheus"]
		require.Contains(t, published(prom), "9090:9090")
		configFile := "/etc/prometheus/prometheus.yml" // the image's default
		for _, arg := range prom.Command {
			if v, ok := strings.CutPrefix(arg, "--config.file="); ok {
				configFile = v
			}
		}
		raw, err := os.ReadFile(hostPath(t, prom, configFile))
		require.NoError(t, err)
		var cfg prometheusConfig
		require.NoError(t, yaml.Unmarshal(raw, &cfg))

		var targets []string
		for _, sc := range cfg.ScrapeConfigs {
			if sc.JobName == "outboxrelay" {
				for _, st := range sc.StaticConfigs {
					targets = append(targets, st.Targets...)
				}
			}
		}
		require.Equal(t, []string{net.JoinHostPort("outboxrelay", port)}, targets,
			"job outboxrelay scrapes the relay service at its OUTBOX_HTTP_ADDR port")

		require.NotEmpty(t, cfg.RuleFiles)
		alerts, err := filepath.Abs("../../monitoring/prometheus/alerts.yml")
		require.NoError(t, err)
		var loaded []string
		for _, f := range cfg.RuleFiles {
			if !path.IsAbs(f) {
				f = path.Join(path.Dir(configFile), f) // relative to the config file
			}
			host := hostPath(t, prom, f)
			require.FileExists(t, host)
			loaded = append(loaded, host)
		}
		require.Contains(t, loaded, alerts, "Prometheus loads the repository's alerts")
	})

	t.Run("grafana", func(t *testing.T) {
		grafana := c.Services["grafana"]
		require.Contains(t, published(grafana), "3000:3000")
		genv := env(grafana)
		require.Equal(t, "true", genv["GF_AUTH_ANONYMOUS_ENABLED"], "anonymous access")
		require.Equal(t, "Viewer", genv["GF_AUTH_ANONYMOUS_ORG_ROLE"])

		// The data source: the profile's Prometheus, by its service name
		// and port, the default.
		dsDir := hostPath(t, grafana, "/etc/grafana/provisioning/datasources")
		files, err := filepath.Glob(filepath.Join(dsDir, "*.yml"))
		require.NoError(t, err)
		require.NotEmpty(t, files, "a datasource provisioning file in %s", dsDir)
		var uids []string
		for _, f := range files {
			raw, err := os.ReadFile(f)
			require.NoError(t, err)
			var ds grafanaDatasources
			require.NoError(t, yaml.Unmarshal(raw, &ds), f)
			for _, d := range ds.Datasources {
				require.Equal(t, "prometheus", d.Type)
				require.Equal(t, "http://prometheus:9090", d.URL)
				require.True(t, d.IsDefault, "the dashboard's ${datasource} picks the default")
				uids = append(uids, d.UID)
			}
		}
		require.Len(t, uids, 1, "one Prometheus data source")

		// The dashboards: the provider's path holds the repository's
		// dashboard, which parses and queries that data source.
		dbDir := hostPath(t, grafana, "/etc/grafana/provisioning/dashboards")
		files, err = filepath.Glob(filepath.Join(dbDir, "*.yml"))
		require.NoError(t, err)
		require.NotEmpty(t, files, "a dashboard provider in %s", dbDir)
		var dashboards []string
		for _, f := range files {
			raw, err := os.ReadFile(f)
			require.NoError(t, err)
			var p grafanaDashboards
			require.NoError(t, yaml.Unmarshal(raw, &p), f)
			for _, prov := range p.Providers {
				require.Equal(t, "file", prov.Type)
				found, err := filepath.Glob(filepath.Join(hostPath(t, grafana, prov.Options.Path), "*.json"))
				require.NoError(t, err)
				dashboards = append(dashboards, found...)
			}
		}
		want, err := filepath.Abs("../../monitoring/grafana/dashboards/outboxrelay.json")
		require.NoError(t, err)
		require.Contains(t, dashboards, want, "Grafana loads the repository's dashboard")
		home := hostPath(t, grafana, genv["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
		require.Equal(t, want, home, "the dashboard is Grafana's home page")
		for _, f := range dashboards {
			checkDashboard(t, f, uids[0])
		}
	})

	t.Run("producer", func(t *testing.T) {
		producer := c.Services["producer"]
		require.Equal(t, relay.Build, producer.Build, "the producer is the relay's image")
		require.GreaterOrEqual(t, len(producer.Command), 3)
		require.Equal(t, "emit", producer.Command[0])
		i := slices.Index(producer.Command, "--rate")
		require.Positive(t, i, "emit --rate N: %v", producer.Command)
		require.Less(t, i+1, len(producer.Command))
		rate, err := strconv.ParseFloat(producer.Command[i+1], 64)
		require.NoError(t, err)
		require.Positive(t, rate)
		require.Contains(t, producer.DependsOn, "outboxrelay", "the relay creates the table")
		flags := map[string]bool{}
		flagNames(reflect.TypeOf(EmitCmd{}), flags)
		for _, arg := range producer.Command[1:] {
			if name, ok := strings.CutPrefix(arg, "--"); ok {
				name, _, _ = strings.Cut(name, "=")
				require.True(t, flags[name], "emit has no flag --%s", name)
			}
		}

		// Every variable the producer sets is one emit reads, and the
		// database and table settings it shares with run are the relay's.
		known := map[string]bool{}
		envVars(reflect.TypeOf(EmitCmd{}), known)
		penv := env(producer)
		require.Equal(t, relayEnv["DATABASE_URL"], penv["DATABASE_URL"], "the producer writes the relay's database")
		for k, v := range penv {
			require.True(t, known[k], "emit reads no variable %s", k)
			if r, ok := relayEnv[k]; ok {
				require.Equal(t, r, v, "the producer's %s is the relay's", k)
			}
		}
	})

	t.Run("demo-queue", func(t *testing.T) {
		q := c.Services["demo-queue"]
		require.Equal(t, c.Services["rabbitmq"].Image, q.Image, "rabbitmqadmin from the broker's image")
		require.Equal(t, types.ServiceConditionHealthy, q.DependsOn["rabbitmq"].Condition)
		script := strings.Join(q.Command, " ")
		exchange := relayEnv["OUTBOX_EXCHANGE"]
		require.Contains(t, script, "declare exchange name="+exchange+" type=topic durable=true", "declared as the relay declares it")
		require.Contains(t, script, "declare binding source="+exchange+" ", "bound to the relay's exchange")
		require.Contains(t, script, "routing_key='#'", "every demo event is routed")
		require.Equal(t, types.ServiceConditionCompletedSuccessfully, c.Services["producer"].DependsOn["demo-queue"].Condition,
			"the producer starts once the queue is bound")
	})
}

// checkDashboard parses a Grafana dashboard and checks that every panel
// with queries has a Prometheus expression on the provisioned data source,
// through the dashboard's ${datasource} variable or by its uid.
func checkDashboard(t *testing.T, file, uid string) {
	t.Helper()
	raw, err := os.ReadFile(file)
	require.NoError(t, err)
	var d struct {
		UID        string `json:"uid"`
		Title      string `json:"title"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Title      string `json:"title"`
			Type       string `json:"type"`
			Datasource *struct {
				Type string `json:"type"`
				UID  string `json:"uid"`
			} `json:"datasource"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &d), "%s is not valid JSON", file)
	require.NotEmpty(t, d.UID, file)
	require.NotEmpty(t, d.Title, file)
	hasVar := slices.ContainsFunc(d.Templating.List, func(v struct {
		Name  string `json:"name"`
		Type  string `json:"type"`
		Query any    `json:"query"`
	}) bool {
		return v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus"
	})
	queried := 0
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		require.NotNil(t, p.Datasource, "panel %q names its data source", p.Title)
		require.Equal(t, "prometheus", p.Datasource.Type, p.Title)
		if p.Datasource.UID == "${datasource}" {
			require.True(t, hasVar, "panel %q uses ${datasource}, which the dashboard defines", p.Title)
		} else {
			require.Equal(t, uid, p.Datasource.UID, "panel %q queries the provisioned data source", p.Title)
		}
		require.NotEmpty(t, p.Targets, "panel %q has queries", p.Title)
		for _, tg := range p.Targets {
			require.NotEmpty(t, strings.TrimSpace(tg.Expr), "panel %q", p.Title)
		}
		queried++
	}
	require.NotZero(t, queried, "%s has panels", file)
}
