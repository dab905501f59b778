"""Shared test setup: offline, quiet, modest threads (the machine has 2 cores)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tests that compare Whisper's words need the same audio every run. Whisper through CTranslate2 int8 is
# deterministic here (the same samples give bit-identical scores run to run, with 1 or 2 threads, on a busy
# machine), but piper samples noise inside its model, so its speech differs each run and tiny.en hears
# near-homophones differently ("moon" as "mint"). Piper's noise is off in every test's synthesis: these two
# reach the configs of servers the tests start, and the test utterances (tests/speech.py) are made the same way.
DETERMINISTIC_TTS = {"SPECVOICE_TTS__NOISE_SCALE": "0", "SPECVOICE_TTS__NOISE_W_SCALE": "0"}
for _name, _value in DETERMINISTIC_TTS.items():
    os.environ.setdefault(_name, _value)

import pytest  # noqa: E402
from hypothesis import settings as hypothesis_settings  # noqa: E402

# Property tests run the same examples every time (a red CI run means the change, not the draw); set
# HYPOTHESIS_PROFILE=explore to search fresh examples while working on a parser.
hypothesis_settings.register_profile("repeatable", derandomize=True, database=None)
hypothesis_settings.register_profile("explore", derandomize=False)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

from voice.config import load_config  # noqa: E402


@pytest.fixture(scope="session")
def small_config():
    """configs/small.toml: the smallest real models."""
    return load_config("configs/small.toml", environ=DETERMINISTIC_TTS)


# ---- the fast tier ---------------------------------------------------------------------------------------------
# `make check` runs the tests not marked `full`: the ones that need no big model, broker or browser and take a few
# seconds each (the small models load once). `make test` runs everything. A module lands in FULL_ONLY_MODULES when
# it needs a broker (mosquitto), a browser, the default (big) models or a running server; a test in SLOW_TESTS runs
# real decodes over many turns, a subprocess per case or a long audio set (each took over 5 s on the 2-core machine).
FULL_ONLY_MODULES = {
    "test_bench_faults",
    "test_bench_pipeline",
    "test_bench_soak",
    "test_home_device",
    "test_llm_big",
    "test_llm_decoder",
    "test_llm_engine",
    "test_llm_llamacpp",
    "test_llm_tree",
    "test_models",
    "test_mqtt_big",
    "test_mqtt_bridge",
    "test_mqtt_guards",
    "test_pipeline",
    "test_pipeline_barge_in",
    "test_pipeline_wake",
    "test_realtime_api",
    "test_realtime_pipecat",
    "test_realtime_tools",
    "test_remote_llm",
    "test_remote_speech",
    "test_serve_cli",
    "test_serve_load",
    "test_serve_mqtt",
    "test_stt",
    "test_systemd",
    "test_toolcalls",
    "test_turn_detection",
    "test_web_page",
    "test_wheel",
    "test_wyoming",
    # tests/hostile/: every one drives a running server
    "test_memory",
    "test_mqtt_fuzz",
    "test_realtime_fuzz",
    "test_realtime_handshake",
    "test_slowloris",
    "test_wyoming_fuzz",
}
SLOW_TESTS = {
    "test_a_device_unplugged_and_plugged_back_is_heard_again",
    "test_streams_portaudio_stopped_are_opened_again",
    "test_a_trim_is_prepared_over_earlier_warm_ups_and_stays_exact",
    "test_references_match_what_was_said",
    "test_speculative_sampling_follows_the_target_distribution",
    "test_warm_between_a_reply_and_its_commit_trims_the_history_before_it",
    "test_fp32_target_with_an_int4_counted_head_draft_is_token_identical",
    "test_the_final_never_drops_committed_words_on_a_busy_cpu",
    "test_block_trimming_keeps_the_prompt_cache_and_the_output_exact",
    "test_sets_cover_every_voice_and_sentence_with_the_right_references",
    "test_warm_trims_ahead_so_the_next_turn_reuses_the_cache",
    "test_samples_are_the_same_in_every_process",
    "test_every_help_exits_0_with_usage_on_stdout",
    "test_draft_and_target_with_different_head_rows_decode_exactly",
    "test_the_local_engine_gets_every_llm_key",
    "test_cancel_during_the_prefill_commits_nothing_and_lands_within_a_chunk",
    "test_wake_word_fires_once_on_its_phrase_only",
    "test_confidence_stop_sampling_is_reproducible_with_a_seed",
    "test_a_stand_in_engine_speaks_say_and_ask",
    "test_ngram_drafting_across_turns_and_after_a_trim_is_exact",
    "test_g711_in_and_out",
    "test_seeded_engine_sampling_on_a_real_model_is_reproducible",
    "test_speaker_to_microphone_round_trip_transcribes_back",
    "test_tone_snr_through_the_server_input_path",
    "test_a_real_run_writes_one_record_per_case_and_publishes_nothing_unallowed",
    "test_a_nonsense_bench_number_is_a_usage_error_naming_the_flag",
    "test_say_and_transcribe_commands_round_trip",
    "test_a_request_with_a_pause_inside_is_not_cut_at_the_pause",
    "test_canceller_reconverges_after_the_delay_jumps",
    "test_round_trip_piper_to_whisper_gives_the_same_words",
    "test_canceller_erle_on_echo_only",
    "test_counts_from_real_replies_round_trip",
    "test_the_vad_rule_when_configured_or_when_the_model_is_missing",
    "test_flush_mid_sentence_stops_the_sound_within_one_block",
    "test_a_pause_the_model_calls_unfinished_cues_an_early_reply_and_the_user_going_on_drops_it",
    "test_noise_scales_at_zero_make_the_same_audio_every_time",
    "test_cli_demo_with_a_bad_question_file_is_a_clear_error",
    "test_bench_llm_bad_list_flag_is_refused_before_any_model_loads",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the full tier (see FULL_ONLY_MODULES); the big-model marker implies it."""
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if isinstance(item, pytest.Function) else ""
        name = item.originalname if isinstance(item, pytest.Function) else item.name
        if module in FULL_ONLY_MODULES or name in SLOW_TESTS or item.get_closest_marker("big"):
            item.add_marker(pytest.mark.full)
